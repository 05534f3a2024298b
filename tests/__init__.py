import pytest

# The helpers in tests/support assert on behalf of the tests: rewritten like test modules'
# asserts, a failing one shows the values it compared instead of a bare AssertionError.
pytest.register_assert_rewrite("tests.support")
