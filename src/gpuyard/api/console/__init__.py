"""What a browser gets: the web console, its sign-in session, the web terminal, the guide
and the API reference.
"""
