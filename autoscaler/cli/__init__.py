"""The ``spotrain`` command line. Each command lives in its own module, imported only when used."""
