"""The CLI's side of the API: the HTTP client, job logs and report pictures."""
