//! Response-side usage tracking (placeholder, filled in next).

fn main() {}
