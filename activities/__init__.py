"""The activity and what it stands on: the contract (payloads, errors, targets), the sweep
activity with its guards, and the SQL engine of the built-in kinds (`activities.engine`)."""
