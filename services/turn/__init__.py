"""TURN for the ``turn`` architecture: the REST API credential scheme, and coturn's setup."""
