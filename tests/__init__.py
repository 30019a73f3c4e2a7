"""The test suite. tests/ and the folders that mirror medusa/ are packages (an ``__init__.py`` each) so that
pytest imports test modules under package-qualified names: ``tests.cli.test_bench`` and
``tests.eval.test_bench`` can both exist (tests/<package>/test_<module>.py mirrors
medusa/<package>/<module>.py).
Shared test code lives in tests/helpers/ (on ``sys.path``, see tests/conftest.py)."""
