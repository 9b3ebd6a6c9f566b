//! Errors: [`ApiError`] is what a client sees (OpenAI's error JSON with the right status); [`Error`] is what
//! starting the server can fail with.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_engine::scheduler::SubmitError;

/// Why `kiln serve` could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Loading the model or building its tokenizer/session failed.
    #[error("cannot load model '{path}': {message}")]
    Load {
        /// The model path.
        path: String,
        /// The cause, as text (it crossed a thread).
        message: String,
    },
    /// The configuration is unusable.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// The async runtime or a signal handler could not be set up.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// An error response in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// Machine-readable code.
    pub code: &'static str,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param.to_string()),
            code: "invalid_value",
        }
    }

    /// A 400 for a field kiln recognises but does not implement.
    pub fn unsupported(param: &str, what: &str) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("'{param}' is not supported by this server: {what}"),
            param: Some(param.to_string()),
            code: "unsupported_parameter",
        }
    }

    /// Any status with a message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code,
        }
    }

    /// OpenAI's error `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        let status = match e {
            SubmitError::QueueFull { .. } | SubmitError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::BAD_REQUEST,
        };
        let (code, param) = match &e {
            SubmitError::PromptTooLong { .. } => ("context_length_exceeded", Some("messages")),
            SubmitError::EmptyPrompt => ("invalid_value", Some("prompt")),
            SubmitError::BadToken { .. } => ("invalid_value", Some("prompt")),
            SubmitError::ZeroMaxTokens => ("invalid_value", Some("max_tokens")),
            SubmitError::QueueFull { .. } => ("queue_full", None),
            SubmitError::ShuttingDown => ("shutting_down", None),
            SubmitError::NoDrafter => ("invalid_value", Some("speculative")),
            _ => ("invalid_value", None),
        };
        ApiError {
            status,
            message: e.to_string(),
            param: param.map(String::from),
            code,
        }
    }
}

impl From<kiln_tokenizer::Error> for ApiError {
    fn from(e: kiln_tokenizer::Error) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "tokenization_failed",
            format!("cannot tokenize the input: {e}"),
        )
    }
}
