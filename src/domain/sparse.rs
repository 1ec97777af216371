//! A list that is usually empty and then costs one word.
//!
//! Most autoscalers have no shadow rule, yet each running one holds its shadows in three places
//! (what to run, what it remembers, what it exports). A `Vec` is three words in each; at 10,000
//! autoscalers that alone is most of a megabyte of nothing.

use std::ops::Deref;

#[derive(Clone, Debug, PartialEq)]
#[expect(clippy::box_collection, reason = "the box is the point: one word when empty, instead of a Vec's three")]
pub struct Sparse<T>(Option<Box<Vec<T>>>);

impl<T> Default for Sparse<T> {
    fn default() -> Self {
        Sparse(None)
    }
}

impl<T> Sparse<T> {
    pub fn push(&mut self, item: T) {
        self.0.get_or_insert_with(Box::default).push(item);
    }

    /// The items, leaving the list empty.
    pub fn take(&mut self) -> Vec<T> {
        self.0.take().map(|items| *items).unwrap_or_default()
    }
}

impl<T> From<Vec<T>> for Sparse<T> {
    fn from(items: Vec<T>) -> Self {
        Sparse((!items.is_empty()).then(|| Box::new(items)))
    }
}

impl<T> Deref for Sparse<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_is_one_word_and_holds_nothing() {
        assert_eq!(std::mem::size_of::<Sparse<String>>(), std::mem::size_of::<usize>());
        let mut list: Sparse<u32> = Sparse::from(Vec::new());
        assert!(list.is_empty());
        list.push(3);
        list.push(4);
        assert_eq!(&*list, &[3, 4]);
        assert_eq!(list.take(), vec![3, 4]);
        assert!(list.is_empty());
    }
}
