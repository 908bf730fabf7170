"""The one typed configuration schema and what reads it whole: the schema (schema.py, with its
sections in train.py, replay.py, model.py and commands.py), the start-up check of its values (checks.py),
the schema as a flat list of dotted keys (keys.py) and the generated reference
(reference.py, docs/configuration.md), the registries' lookup error (registry.py), and where
exgrpo's own files and the running Hydra app's settings are (paths.py).

Nothing here imports a stage of the train step: every other folder may read the config."""
