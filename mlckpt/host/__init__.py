"""The host: what it is, as measured (``facts``), and what the vendor declares about the system
(``description``)."""
