"""The files sharing an expensive session fixture form one unit of work; a file using one unlisted is refused."""

from __future__ import annotations

from shared_workers import SHARED, misplaced, scope_of


def test_the_files_of_a_shared_fixture_are_one_unit_and_every_other_file_its_own() -> None:
    files = SHARED["local_llm"]
    scopes = {scope_of(f"{path}::test_x") for path in files} | {scope_of(f"{files[0]}::Class::test_y[param]")}
    assert len(scopes) == 1 and scopes != {files[0]}
    assert scope_of("tests/ipc/test_ping.py::test_x") == "tests/ipc/test_ping.py"
    assert scope_of("tests/ipc/test_ping.py::test_y") == scope_of("tests/ipc/test_ping.py::test_x")


def test_a_file_using_a_shared_fixture_must_be_listed_with_it() -> None:
    assert misplaced(SHARED["local_llm"][1], {"local_llm", "tmp_path"}) is None
    assert misplaced("tests/ipc/test_ping.py", {"tmp_path", "ha"}) is None
    reason = misplaced("tests/voice/test_new.py", {"tmp_path", "local_llm"})
    assert reason is not None
    assert "'local_llm'" in reason and "tests/voice/test_new.py" in reason and "shared_workers.py" in reason
