//! Tenants: the platform's `TenantQuota` objects, compiled for the auth and quota stages.
