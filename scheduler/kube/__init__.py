"""Kubernetes adapters: the ingestor (API → intake), the binder (ledger → API) and mappings."""
