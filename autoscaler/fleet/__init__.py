"""The clouds a controller runs on: building the provider, several clouds as one, the market, billing."""
