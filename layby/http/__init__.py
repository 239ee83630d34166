"""layby.http: the HTTP edge. FastAPI routes for `/v1`, AG-UI, the reviewers' answer page,
callbacks and inbound mail, `/metrics`; the one table from domain errors to status codes."""
