"""REST routes of tenancy and money: accounts, members and keys of the caller (me),
projects, quotas, budgets, billing, account secrets, registry credentials and the audit
trail.
"""
