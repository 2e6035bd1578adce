"""Job checkpoints: discover, validate and report them (``scan``), one module per format family, and set a partial
newest one aside so the framework's own resume picks the previous complete one (``quarantine``).
Validation reads file structure only: nothing is loaded, nothing pickled is run (``inert_pickle``).
"""
