"""The controller's HTTP face: the user API and its models, the dashboard, metrics, job lists, resume."""
