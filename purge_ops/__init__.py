"""Operating the sweep: connections, the worker process, the schedule, passes and their report."""
