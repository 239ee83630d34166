"""`python -m layby`: the `layby` command."""

from layby.ops.cli import main

main()
