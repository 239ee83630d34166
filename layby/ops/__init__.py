"""layby.ops: running layby. The `layby` command, the supervisor of `layby up`, the embedded
Valkey server, `layby doctor` and the Flower launcher."""
