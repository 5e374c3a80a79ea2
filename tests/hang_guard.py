"""The one time limit the tests use: a guard against a hung child process or a wait that
never ends, not a measure of speed. Every run it guards takes seconds to a few minutes on
2 busy CPU cores; nothing a test asserts depends on how long it took."""

HANG_GUARD_SECONDS = 3600
