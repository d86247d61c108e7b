//! The change DB module against a real PostgreSQL: exact rows left by every purge, ownership checks, the
//! `ownerAddress` compare-and-set, coexistence with Zero 0.20's SERIALIZABLE storer, missing schemas, lost
//! connections, TLS modes and watermark ordering.
//!
//! Every case needs PostgreSQL (`SIDECAR_TEST_DATABASE_URL`): they are in [`pg`].

mod pg;
