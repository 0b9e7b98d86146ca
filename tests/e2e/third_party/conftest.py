"""The wheel folders here run their own tests, in a session of their own (tests/e2e/test_third_party_quantization.py);
the project's session leaves them alone, so their conftest never registers them for every other test."""

collect_ignore = ["int4_g128"]
