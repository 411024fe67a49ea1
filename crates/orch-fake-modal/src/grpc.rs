//! The gRPC service: each RPC of `modal.client.ModalClient` that orch and the official
//! clients call, after the auth check and the call record ([`Inner::enter`]); sessions,
//! environments, apps and secrets here, images, volumes/mounts and sandboxes in their files.

use super::state::{now_s, Inner, Stream};
use super::{images, sandboxes, volumes};
use orch_modal_proto::{self as proto, modal_client_server::ModalClient, ObjectCreationType};
use std::sync::Arc;
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub(super) struct Svc(pub(super) Arc<Inner>);

#[tonic::async_trait]
impl ModalClient for Svc {
    async fn client_hello(&self, req: Request<()>) -> Result<Response<proto::ClientHelloResponse>, Status> {
        self.0.enter("ClientHello", &req)?;
        Ok(Response::new(proto::ClientHelloResponse {
            warning: String::new(),
            image_builder_version: "2025.06".into(),
        }))
    }

    async fn auth_token_get(
        &self,
        req: Request<proto::AuthTokenGetRequest>,
    ) -> Result<Response<proto::AuthTokenGetResponse>, Status> {
        self.0.enter("AuthTokenGet", &req)?;
        use base64::Engine;
        let exp = now_s() as u64 + 3600;
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let token = format!(
            "{}.{}.fake",
            b.encode(r#"{"alg":"none","typ":"JWT"}"#),
            b.encode(format!(r#"{{"exp":{exp}}}"#))
        );
        Ok(Response::new(proto::AuthTokenGetResponse { token }))
    }

    async fn environment_get_or_create(
        &self,
        req: Request<proto::EnvironmentGetOrCreateRequest>,
    ) -> Result<Response<proto::EnvironmentGetOrCreateResponse>, Status> {
        self.0.enter("EnvironmentGetOrCreate", &req)?;
        let r = req.into_inner();
        let name = if r.deployment_name.is_empty() {
            "main".to_string()
        } else {
            r.deployment_name
        };
        Ok(Response::new(proto::EnvironmentGetOrCreateResponse {
            environment_id: format!("en-{name}"),
            metadata: Some(proto::EnvironmentMetadata {
                name,
                settings: Some(proto::EnvironmentSettings {
                    image_builder_version: "2025.06".into(),
                    webhook_suffix: String::new(),
                }),
            }),
        }))
    }

    async fn app_get_or_create(
        &self,
        req: Request<proto::AppGetOrCreateRequest>,
    ) -> Result<Response<proto::AppGetOrCreateResponse>, Status> {
        self.0.enter("AppGetOrCreate", &req)?;
        let r = req.into_inner();
        let mut st = self.0.state.lock().unwrap();
        let key = (r.environment_name.clone(), r.app_name.clone());
        let id = match st.apps.get(&key) {
            Some(id) => id.clone(),
            None if r.object_creation_type == ObjectCreationType::CreateIfMissing as i32
                || r.object_creation_type == ObjectCreationType::Ephemeral as i32 =>
            {
                let id = self.0.id("ap");
                st.apps.insert(key, id.clone());
                id
            }
            None => return Err(Status::not_found(format!("app `{}` not found", r.app_name))),
        };
        Ok(Response::new(proto::AppGetOrCreateResponse { app_id: id }))
    }

    async fn image_get_or_create(
        &self,
        req: Request<proto::ImageGetOrCreateRequest>,
    ) -> Result<Response<proto::ImageGetOrCreateResponse>, Status> {
        self.0.enter("ImageGetOrCreate", &req)?;
        images::get_or_create(&self.0, req.into_inner())
    }

    type ImageJoinStreamingStream = Stream<proto::ImageJoinStreamingResponse>;

    async fn image_join_streaming(
        &self,
        req: Request<proto::ImageJoinStreamingRequest>,
    ) -> Result<Response<Self::ImageJoinStreamingStream>, Status> {
        self.0.enter("ImageJoinStreaming", &req)?;
        images::join_streaming(&self.0, req.into_inner()).await
    }

    async fn secret_get_or_create(
        &self,
        req: Request<proto::SecretGetOrCreateRequest>,
    ) -> Result<Response<proto::SecretGetOrCreateResponse>, Status> {
        self.0.enter("SecretGetOrCreate", &req)?;
        let r = req.into_inner();
        let id = self.0.id("st");
        self.0
            .state
            .lock()
            .unwrap()
            .secrets
            .insert(id.clone(), r.env_dict.into_iter().collect());
        Ok(Response::new(proto::SecretGetOrCreateResponse { secret_id: id }))
    }

    async fn volume_get_or_create(
        &self,
        req: Request<proto::VolumeGetOrCreateRequest>,
    ) -> Result<Response<proto::VolumeGetOrCreateResponse>, Status> {
        self.0.enter("VolumeGetOrCreate", &req)?;
        volumes::volume_get_or_create(&self.0, req.into_inner())
    }

    async fn volume_get_file2(
        &self,
        req: Request<proto::VolumeGetFile2Request>,
    ) -> Result<Response<proto::VolumeGetFile2Response>, Status> {
        self.0.enter("VolumeGetFile2", &req)?;
        volumes::volume_get_file(&self.0, req.into_inner())
    }

    async fn mount_get_or_create(
        &self,
        req: Request<proto::MountGetOrCreateRequest>,
    ) -> Result<Response<proto::MountGetOrCreateResponse>, Status> {
        self.0.enter("MountGetOrCreate", &req)?;
        volumes::mount_get_or_create(&self.0, req.into_inner())
    }

    async fn mount_put_file(
        &self,
        req: Request<proto::MountPutFileRequest>,
    ) -> Result<Response<proto::MountPutFileResponse>, Status> {
        self.0.enter("MountPutFile", &req)?;
        volumes::mount_put_file(&self.0, req.into_inner())
    }

    async fn blob_create(
        &self,
        req: Request<proto::BlobCreateRequest>,
    ) -> Result<Response<proto::BlobCreateResponse>, Status> {
        self.0.enter("BlobCreate", &req)?;
        volumes::blob_create(&self.0, req.into_inner())
    }

    async fn sandbox_create(
        &self,
        req: Request<proto::SandboxCreateRequest>,
    ) -> Result<Response<proto::SandboxCreateResponse>, Status> {
        self.0.enter("SandboxCreate", &req)?;
        sandboxes::create(&self.0, req.into_inner())
    }

    async fn sandbox_get_task_id(
        &self,
        req: Request<proto::SandboxGetTaskIdRequest>,
    ) -> Result<Response<proto::SandboxGetTaskIdResponse>, Status> {
        self.0.enter("SandboxGetTaskId", &req)?;
        sandboxes::get_task_id(&self.0, req.into_inner()).await
    }

    type SandboxGetLogsStream = Stream<proto::TaskLogsBatch>;

    async fn sandbox_get_logs(
        &self,
        req: Request<proto::SandboxGetLogsRequest>,
    ) -> Result<Response<Self::SandboxGetLogsStream>, Status> {
        self.0.enter("SandboxGetLogs", &req)?;
        sandboxes::get_logs(&self.0, req.into_inner())
    }

    async fn sandbox_wait(
        &self,
        req: Request<proto::SandboxWaitRequest>,
    ) -> Result<Response<proto::SandboxWaitResponse>, Status> {
        self.0.enter("SandboxWait", &req)?;
        sandboxes::wait(&self.0, req.into_inner()).await
    }

    async fn sandbox_terminate(
        &self,
        req: Request<proto::SandboxTerminateRequest>,
    ) -> Result<Response<proto::SandboxTerminateResponse>, Status> {
        self.0.enter("SandboxTerminate", &req)?;
        sandboxes::terminate(&self.0, req.into_inner())
    }

    async fn sandbox_list(
        &self,
        req: Request<proto::SandboxListRequest>,
    ) -> Result<Response<proto::SandboxListResponse>, Status> {
        self.0.enter("SandboxList", &req)?;
        sandboxes::list(&self.0, req.into_inner())
    }
}
