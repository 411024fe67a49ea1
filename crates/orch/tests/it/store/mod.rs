//! The store under faults (`kill -9`, two writers, a full disk, few files) and on S3 (real servers, outages).

mod faults;
mod s3;
mod s3faults;
