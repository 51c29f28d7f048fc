"""Tenancy: accounts, members, projects, API keys, sessions, secrets, webhooks, audit, and
who may act on what.
"""
