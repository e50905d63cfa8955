// The API reference: renders /openapi.json with no external script (served from the
// package under the operator page's Content-Security-Policy; text only, never HTML
// from the document).
"use strict";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function schemaName(schema) {
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.type === "array") return schemaName(schema.items) + "[]";
  if (schema.anyOf) return schema.anyOf.map(schemaName).join(" | ");
  return schema.type || "";
}

function operation(path, method, op) {
  const params = (op.parameters || []).map((p) =>
    el("li", {}, el("code", {}, p.name), " (" + p.in + (p.required ? ", required" : "") + ") ",
      schemaName(p.schema), p.description ? ": " + p.description : ""));
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  const statuses = Object.entries(op.responses || {}).map(([code, r]) =>
    el("li", {}, el("code", {}, code), " " + (r.description || "")));
  return el("section", { class: "op" },
    el("h3", {}, el("code", {}, method.toUpperCase() + " " + path), " ", op.summary || ""),
    op.description ? el("p", {}, op.description) : null,
    params.length ? el("ul", {}, ...params) : null,
    body ? el("p", {}, "Body: ", el("code", {}, schemaName(body.schema))) : null,
    el("ul", { class: "muted" }, ...statuses));
}

async function main() {
  const root = document.getElementById("docs");
  const response = await fetch("/openapi.json", { credentials: "same-origin" });
  if (!response.ok) {
    root.replaceChildren(el("p", { class: "notice" }, "Could not load /openapi.json (" + response.status + ")."));
    return;
  }
  const doc = await response.json();
  const sections = [el("h2", {}, doc.info.title + " " + doc.info.version), el("pre", {}, doc.info.description || "")];
  for (const [path, methods] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(methods)) sections.push(operation(path, method, op));
  }
  root.replaceChildren(...sections);
}

main();
