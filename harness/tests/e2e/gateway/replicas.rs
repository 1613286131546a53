//! (placeholder: filled in by the helper that owns this suite)
