"""Loopback fakes of cloud endpoints, shared by the test suites."""
