//! Token-bucket quotas: per tenant x model request, token and concurrency limits.
