"""Billing: the usage ledger and its totals, budgets and prepaid balances, quotas, quotes,
spot prices, and admission of new work.
"""
