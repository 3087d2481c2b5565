import this_module_does_not_exist  # type: ignore[import-not-found]  # noqa: F401

import cronlock  # noqa: F401
