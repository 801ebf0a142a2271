"""Coverage-guided fuzzing (atheris): pure targets in ``targets``, the runner in ``atheris_targets``."""
