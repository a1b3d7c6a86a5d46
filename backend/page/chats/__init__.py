"""Chats that last: Chainlit's SQLAlchemy data layer on SQLite (default) or Postgres.

``database`` says where the database is, ``schema`` creates and upgrades its tables, ``writer``
takes the writes off the reply's path, ``store`` is the data layer, ``identity`` says who asks (and
gives loopback without login one local user), ``opening`` sets it all up at the page's start,
``resume`` rebuilds a reopened chat's history and ``export`` makes ``/export``'s downloads.
"""
