"""gateway: the HTTP API (`/v1`), the demo ledger page, and the `layby` command."""
