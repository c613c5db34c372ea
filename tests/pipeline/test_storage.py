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
