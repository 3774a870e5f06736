"""Schema tooling: the versioned SQL and its install script (``install``),
the Alembic chain (``migrate``), ``CREATE EXTENSION alk`` (``extension``),
the PL/Proxy router (``router``), the connect-time version check
(``compat``), the SQL reference renderer (``docgen``) and where the SQL
files live (``resources``)."""
