//! A binding inside a `__nvmq_meta` record (`MetaRecord::AclAdded`, tag 12, and `AclRemoved`,
//! tag 13): its wire fields, strings length-prefixed. Read back through the same checks as a
//! CreateAcls, so a damaged record is refused by name rather than taken.

use super::{Binding, Wire};
use crate::meta::{put_str, Cursor};

pub(crate) fn put(out: &mut Vec<u8>, b: &Binding) {
    out.push(b.pattern.resource.code() as u8);
    out.push(b.pattern.kind.code() as u8);
    put_str(out, &b.pattern.name);
    put_str(out, &b.entry.principal.to_string());
    put_str(out, &b.entry.host.to_string());
    out.push(b.entry.op.code() as u8);
    out.push(b.entry.permission.code() as u8);
}

pub(crate) fn get(c: &mut Cursor<'_>) -> Result<Binding, String> {
    let resource_type = c.u8()? as i8;
    let pattern_type = c.u8()? as i8;
    let name = c.str()?;
    let principal = c.str()?;
    let host = c.str()?;
    let op = c.u8()? as i8;
    let permission = c.u8()? as i8;
    Binding::from_wire(Wire {
        resource_type,
        name: &name,
        pattern_type,
        principal: &principal,
        host: &host,
        op,
        permission,
    })
    .map_err(|e| format!("ACL binding: {e}"))
}
