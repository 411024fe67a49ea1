//! Each backend end to end (docker, kubernetes, modal, slurm), and the images, files and way home they share.

mod docker;
mod files;
mod gpu_images;
mod kubernetes;
mod modal;
mod registry;
mod ship;
mod slurm;
