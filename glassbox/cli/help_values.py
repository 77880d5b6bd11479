"""The library's values that the parsers show in ``--help``, repeated here so that building the parsers
imports neither torch nor the models (``glassbox --help`` then answers in a tenth of a second instead
of seconds). ``tests/test_cli_help_fast.py`` checks that each equals the library's own.
"""

DEFAULT_MODEL = "glassbox-austen"  # glassbox.weights.pretrained.DEFAULT_MODEL
PRESET_NAMES = ("classic", "gpt2", "modern")  # sorted(glassbox.models.presets.PRESETS)
DEFAULT_ANSWER, DEFAULT_DISTRACTOR = " letter", " garden"  # glassbox.interp.report's
DEFAULT_PROMPT = ("Elizabeth read the letter again, and then walked to the window. When Jane came in, "
                  "Elizabeth read the")  # glassbox.interp.report.DEFAULT_PROMPT
PARITY_TOLERANCE = {"float32": 1e-5, "float64": 1e-10}  # glassbox.interp.report.PARITY_TOLERANCE, by dtype name
