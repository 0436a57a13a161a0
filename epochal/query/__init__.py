"""Reading committed epochs: read-only SQL over one consistent cut of every table."""
