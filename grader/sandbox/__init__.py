"""The trust line: starting a worker process and containing it (namespaces, docker, none)."""
