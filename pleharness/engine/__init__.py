"""Engine lifecycle (launch or attach), HTTP client, engine facts and /metrics scraping."""
