"""What operators run the service with: health and metrics endpoints, the request
log, security headers and the gunicorn configuration."""
