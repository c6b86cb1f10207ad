from envfile import parse_env


def test_simple_settings():
    text = "# database\nHOST = localhost\n\nPORT=5432\n"
    assert parse_env(text) == {"HOST": "localhost", "PORT": "5432"}
