"""A user module that fails while importing (the loader must say so, not 'not found')."""
import a_module_that_is_not_installed  # noqa: F401
