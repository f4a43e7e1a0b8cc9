// Building the page's elements. Every text from the node (queue names, payloads, errors) goes in
// as textContent or an attribute value, never as markup: a name can hold anything.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "value") el.value = value;
    else if (key === "checked") el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// A link to a page of the UI: the parts are encoded, so a name cannot leave the hash.
export function link(text, ...parts) {
  return h("a", { href: "#/" + parts.map(encodeURIComponent).join("/") }, text);
}

// A table of `rows`; `columns` are [heading, row => cell content, className?]. Each cell is
// marked with its column (data-col) and, given `key`, each row with its object (data-key), so a
// row can be found by what it shows (the UI's test does).
export function table(columns, rows, empty = "none", key = null) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, columns.map(([heading]) => h("th", {}, heading)))),
    h(
      "tbody",
      {},
      rows.map((row) =>
        h("tr", { "data-key": key && key(row) }, columns.map(([heading, cell, cls]) => h("td", { class: cls, "data-col": heading }, cell(row)))),
      ),
    ),
  );
}

export function num(value) {
  return value === undefined || value === null ? "" : Number(value).toLocaleString("en");
}

// A small form: `fields` are elements (inputs made with `field`), `submit` gets the form's
// values by name and is awaited; errors are shown by the caller's notice.
export function form(id, fields, label, submit) {
  const el = h("form", { id, class: "inline" }, fields, h("button", { type: "submit" }, label));
  el.addEventListener("submit", (event) => {
    event.preventDefault();
    const values = {};
    for (const input of el.querySelectorAll("input, select, textarea")) {
      values[input.name] = input.type === "checkbox" ? input.checked : input.value;
    }
    submit(values, el);
  });
  return el;
}

export function field(label, name, attrs = {}) {
  const tag = attrs.tag || "input";
  const { tag: _tag, options, ...rest } = attrs;
  const input = h(tag, { name, ...rest }, options ? options.map((o) => h("option", { value: o }, o)) : []);
  if (options && rest.value !== undefined) input.value = rest.value;
  return h("label", {}, label, input);
}

// The "arguments" of a declare, as RabbitMQ's UI asks for them: a JSON object (empty: none).
export function argumentsField(placeholder) {
  return field("arguments", "arguments", { placeholder, size: 28 });
}

// The object an "arguments" field holds; an Error saying what is wrong when it is not one
// (nothing is sent then).
export function parseArguments(text) {
  if (!text || !text.trim()) return {};
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new Error(`arguments: not JSON (${error.message})`);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new Error('arguments: a JSON object is needed, such as {"x-max-length": 1000}');
  }
  return parsed;
}

export function section(title, ...children) {
  return h("section", {}, h("h2", {}, title), children);
}
