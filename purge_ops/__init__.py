"""Operating the sweep: connections, the worker process, dev mode and embedded servers."""
