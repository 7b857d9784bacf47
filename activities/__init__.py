"""Everything that touches a database: targets, their SQL, the sweep activity and the config."""
