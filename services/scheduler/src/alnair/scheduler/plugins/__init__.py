"""Scheduling plugins: filters, the placement policies, and the registry that names them."""
