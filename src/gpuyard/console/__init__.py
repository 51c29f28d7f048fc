"""The web console's static files (static/): plain ES modules and CSS, served as they
are by api/console/page.py — no build step, nothing fetched from elsewhere at run time."""
