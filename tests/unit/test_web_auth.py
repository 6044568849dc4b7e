"""The API's users: parsed from configuration, tokens known only by their digest."""

from __future__ import annotations

import pytest

from sasflow.errors import ConfigurationError
from sasflow.web.auth import OPERATOR, VIEWER, Principal, Users, new_token


def test_a_new_token_is_admitted_by_its_line_alone() -> None:
    token, line = new_token("ann", OPERATOR)
    assert token not in line and line.startswith("ann:operator:sha256:")
    users = Users.parse(f"# the on-call team\n\n{line}\n", "tokens")
    assert users.authenticate(token) == Principal("ann", OPERATOR)
    assert users.authenticate(token + "x") is None
    assert users.authenticate("") is None


def test_the_environment_form_holds_several_users_on_one_line() -> None:
    (viewer, v_line), (operator, o_line) = new_token("v", VIEWER), new_token("o", OPERATOR)
    users = Users.parse(f"{v_line},{o_line}", "SASFLOW_API_TOKENS")
    assert users.authenticate(viewer) == Principal("v", VIEWER)
    assert users.authenticate(operator) == Principal("o", OPERATOR)


@pytest.mark.parametrize("text", ["ann:admin:sha256:" + "0" * 64, "ann:viewer:" + "0" * 64,
                                  "ann:viewer:sha256:xyz", "a b:viewer:sha256:" + "0" * 64])
def test_a_bad_line_is_a_configuration_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigurationError, match="line 1: expected NAME:ROLE:sha256:HEX"):
        Users.parse(text, "tokens")


def test_a_user_named_twice_is_refused() -> None:
    _, first = new_token("ann", VIEWER)
    _, second = new_token("ann", OPERATOR)
    with pytest.raises(ConfigurationError, match="named twice"):
        Users.parse(f"{first}\n{second}", "tokens")


def test_an_operator_may_do_what_a_viewer_may_and_not_the_reverse() -> None:
    assert Principal("o", OPERATOR).may(VIEWER) and Principal("o", OPERATOR).may(OPERATOR)
    assert Principal("v", VIEWER).may(VIEWER) and not Principal("v", VIEWER).may(OPERATOR)


@pytest.mark.parametrize(("name", "role"), [("ann", "root"), ("", VIEWER), ("a:b", VIEWER)])
def test_new_token_refuses_bad_names_and_roles(name: str, role: str) -> None:
    with pytest.raises(ConfigurationError):
        new_token(name, role)
