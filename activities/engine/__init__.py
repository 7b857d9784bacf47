"""The SQL engine of the built-in kinds: rules bound to real tables, the plan of each sweep,
the batches, and every statement they run (`statements`)."""
