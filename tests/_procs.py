"""Programs the tests run as real processes."""

#: ``python -c`` source of a ``dlpack`` run whose plan stage raises an unexpected error (a bug in
#: dlpack as far as the CLI can tell): what exit code 3 must report.
INTERNAL_ERROR_MAIN = (
    "import importlib, sys\n"
    "b = importlib.import_module('dlpack.pack')\n"
    "def boom(*a, **k): raise KeyError('plan')\n"
    "b.plan_stage = boom\n"
    "from dlpack.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
