from stoker.pipeline.storage import parse_storage_options, redact_options


def test_credentials_are_masked_at_any_depth_and_the_rest_kept():
    opts = parse_storage_options(
        ["endpoint_url=http://h:9000", "key=AKIA", "secret=s", "client_kwargs.aws_session_token=t", "anon=false"]
    )
    assert redact_options(opts) == {
        "endpoint_url": "http://h:9000",
        "key": "***",
        "secret": "***",
        "client_kwargs": {"aws_session_token": "***"},
        "anon": False,
    }
    assert opts["secret"] == "s"  # the options themselves are not changed
    assert redact_options(None) is None


def test_a_refused_connection_on_a_port_holding_403_is_not_called_access_denied():
    """The server's port is in the message ("127.0.0.1:40312"): a 403 status is matched as a word."""
    from stoker.pipeline.storage import _describe

    refused = ConnectionRefusedError("Cannot connect to host 127.0.0.1:40312 ssl:default [Connection refused]")
    assert "cannot reach the server of s3://b/x" in str(_describe(refused, "s3://b/x"))
    denied = OSError("An error occurred (403) when calling the HeadObject operation: Forbidden")
    assert "access denied to s3://b/x" in str(_describe(denied, "s3://b/x"))
