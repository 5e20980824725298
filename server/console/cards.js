// A model's card: its name and a badge saying what it is (the live and served views both draw one).
export function modelCard(name, badge) {
  const root = document.createElement("article");
  root.className = "card";
  root.dataset.model = name;
  const head = document.createElement("div");
  head.className = "card-head";
  const title = document.createElement("h3");
  title.textContent = name;
  const kind = document.createElement("span");
  kind.className = "badge";
  kind.textContent = badge;
  head.append(title, kind);
  return { root, head };
}
