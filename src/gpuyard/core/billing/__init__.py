"""Money arithmetic: prices, the usage ledger, budgets and balances, quotas, the spot
market.
"""
