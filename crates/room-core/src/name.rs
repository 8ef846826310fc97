//! Names of agents, rooms and projects. They become directory names and wake queue paths, so
//! the shape is strict: no `/`, no `..`, no NUL or control characters, nothing a shell or a path
//! join could reinterpret.

use crate::refusal::Refusal;

pub const NAME_BYTES_MAX: usize = 64;

/// Check a user-chosen name; `field` names the argument in the error.
pub fn validate(field: &str, name: &str) -> Result<(), Refusal> {
    if name.is_empty() {
        return Err(Refusal::invalid(field, "must not be empty"));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(Refusal::invalid(
            field,
            format!("longer than {NAME_BYTES_MAX} bytes"),
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(Refusal::invalid(
            field,
            format!("contains control character {:?}", c),
        ));
    }
    if name.contains('/') || name.contains('\\') {
        return Err(Refusal::invalid(field, "contains a path separator"));
    }
    if name.contains("..") {
        return Err(Refusal::invalid(field, "contains '..'"));
    }
    let first = name.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first.is_ascii_digit()) {
        return Err(Refusal::invalid(
            field,
            "must start with a lower-case letter or digit",
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')))
    {
        return Err(Refusal::invalid(
            field,
            format!("character {c:?} is not allowed (use a-z 0-9 - _ .)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tricks_are_refused_with_the_field_named() {
        for bad in [
            "",
            "a/b",
            "..",
            "a..b",
            "a\0b",
            "a\nb",
            "-x",
            "Ab",
            "é",
            &"x".repeat(65),
        ] {
            let r = validate("agent", bad).unwrap_err();
            assert!(r.message.starts_with("agent: "), "{bad:?} -> {}", r.message);
        }
        for good in ["alpha", "reviewer-beta", "r2.d2", "a_b"] {
            validate("agent", good).unwrap();
        }
    }
}
